"""What the tests share: one module per concept, each used by every folder
that needs it (a helper is written here once, not again in a test module).

- :mod:`.waiting`: bounded waits for a condition (Trio, blocking, asyncio).
"""
