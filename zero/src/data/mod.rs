//! Training data: llm.c token files, GPT-2 BPE preparation, and per-rank batch loading.
