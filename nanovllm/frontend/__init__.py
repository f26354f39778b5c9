"""The front end: text in, text out; tokenization, detokenization and stop strings around the engine core."""
