"""The build cache (`build.cache_dir`) and build leftovers: what is there, and pruning it (`attnforge cache`)."""
