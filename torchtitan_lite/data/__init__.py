"""Training data: the bundled corpus, the tokenizer, and loaders of packed token windows."""
