"""The web test app as a module attribute, for the operator commands' tests."""

from tests.ops.webapp import build

app = build("opscli")
