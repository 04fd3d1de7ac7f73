"""fakensq's pytest plugin, registered through the ``pytest11`` entry point.

Fixtures are added here as the nodes they start become available.
"""
