"""The numpy backend. Importing it changes nothing in the process: setup.prepare() does,
when the first CpuModel is made."""
