"""Wheels after the build: their names (`naming`), the manifest beside each wheel (`manifest`), reading and
writing a wheel reproducibly (`wheelio`), and finalize (`finalize`: local version, torch pin, audit).
"""
