"""Data: text -> tokenizer -> token store -> packed store."""
