"""Modelling code that `objtrain export` writes into an export directory for a model kind no stock
`transformers` class computes (the encoder-decoder). transformers loads it with `trust_remote_code=True`
through `auto_map` in config.json. These files import only torch and transformers: they are copied as
they are, and objtrain never imports them itself."""
