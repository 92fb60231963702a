# pyinfra reads this file from the deploy directory before anything else.
REQUIRE_PYINFRA_VERSION = "==3.10.*"

# The one gate for text from hosts (and for secrets) wraps the CLI's output from here on: what
# pyinfra prints while it connects (an SSH error quoting the server's banner) comes before it loads
# the entry point.
import operations.run.redact  # noqa: E402, F401
