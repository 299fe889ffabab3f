"""The command line: `shipper` and `shipper-setup`, argv -> calls -> exit codes, on top of every
other room; nothing below imports it."""
