"""Publishing finalized wheels: the static per-variant index (`index`) with its coverage page (`coverage`) and
yanks (`yank`), uploads to an index server (`upload`), a local index server (`index_server`), and the release with
its gates (parity, no half-published state) in front of them (`release`). Destinations are matrix data
(`matrix/destinations.py`).
"""
