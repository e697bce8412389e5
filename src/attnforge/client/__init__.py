"""The user's side: which wheel of an index fits this environment (`which`), does the installed one work
(`doctor`), which prebuilt image fits this host (`pull`).
"""
