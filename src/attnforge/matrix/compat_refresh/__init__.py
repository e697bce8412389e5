"""`attnforge compat refresh`: what the package index has that the compat data in use does not."""
