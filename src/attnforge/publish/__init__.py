"""Publishing finalized wheels: the static per-variant index, uploads to an index server, serving, and the
gates (parity, no half-published state) in front of them."""
