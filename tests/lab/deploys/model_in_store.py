"""A test deploy: one model into a host's store from another host (`transfer.in_store`, as deploys/models.py adds it),
and nothing else.

    pyinfra INVENTORY tests/lab/deploys/model_in_store.py -y --limit RECEIVER --data model=NAME --data source=HOST
"""

from pyinfra import host

from operations.model import transfer

transfer.in_store(
    name=f"Model {host.data.model} in the store",
    model=host.data.model,
    path=f"/root/models/{host.data.model}",
    source=host.data.source,
    source_store="/root/models",
)
