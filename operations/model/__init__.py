"""Models: put into a host's store from another host or this machine (transfer), verified against
their origin's digests (model_digests), and staged into shm, now and at every boot (models,
on_host/stage_model.py).
"""
