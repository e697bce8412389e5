"""The user's side: which wheel fits this environment (`which`), does the installed one work (`doctor`),
which image fits this host (`pull`), and the environment probe they share."""
