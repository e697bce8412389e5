"""Where the builder runs: docker (a builder image per toolkit), host (this machine's toolkit, a cached
venv), env (an existing interpreter's torch: a GPU runner, an NGC image), and the routing between them."""
