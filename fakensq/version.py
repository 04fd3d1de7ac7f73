"""The NSQ release fakensq reproduces, shared by nsqd, nsqlookupd and nsqadmin."""

__all__ = ["GO_TOOLCHAIN", "VERSION"]

#: The NSQ version fakensq reports (IDENTIFY, /info, /ping's peers, --version).
VERSION = "1.3.0"
#: The Go toolchain the reference v1.3.0 binaries name (``--version``, text /stats).
GO_TOOLCHAIN = "go1.27.3"
