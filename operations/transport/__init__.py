"""Bytes between hosts: streams over the SSH connections pyinfra holds or OpenSSH, the one-time
keys that let one inventory host send to another (forced command: on_host/peer_send.py), root's
unpacker on the receiver (on_host/untar_as_root.py), and fan-out from hosts that already hold the
bytes. The environment and model rooms move their bytes through here.
"""
