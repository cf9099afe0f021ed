"""The WebGPU backend (wgpu + WGSL compute shaders in shaders/)."""
