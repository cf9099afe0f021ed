"""Getting models: the catalogue of released ones and downloads from the Hugging Face hub."""
