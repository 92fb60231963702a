# pyinfra reads this file from the deploy directory before anything else.
REQUIRE_PYINFRA_VERSION = "==3.10.*"
