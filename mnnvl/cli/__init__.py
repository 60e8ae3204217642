"""The ``mnnvl`` command (also ``python -m mnnvl``): ``main`` dispatches, ``parser`` builds the
subcommands and their flags, ``help`` holds each command's help and examples."""
