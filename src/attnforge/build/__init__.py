"""The build engine: plan cells into real wheels (docker or local backend)."""
