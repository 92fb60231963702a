"""The lab's group data: overrides group_data/all.yml for the lab's hosts. Edit all.yml beside this file."""

from configuration.settings import load_group_yaml

globals().update(load_group_yaml(__file__))
