"""One deploy at a time per host: the host lock taken with the host's first read, renewed, given
back (on_host/lock_host.py runs on the host). Imports only the run room.
"""
