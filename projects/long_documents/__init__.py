"""Long documents: the man pages at 512 to 4,096 tokens, from scratch and two-stage
(``configs/``; docs/long_context.md)."""
