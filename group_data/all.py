"""Group data for every host. Edit all.yml beside this file, not this file."""

from configuration.settings import load_group_yaml

globals().update(load_group_yaml(__file__))
