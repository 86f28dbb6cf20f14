"""Presentation for the CLI: what `objtrain corrupt` shows (`views.corrupt`), kept out of the objectives so
`objtrain/objectives/` holds pure transforms only."""
