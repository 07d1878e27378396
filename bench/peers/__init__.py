"""bench.peers: pgdispatch beside its peers, side by side (`python -m bench.peers`; see __main__)."""

__all__: list[str] = []
