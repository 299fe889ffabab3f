"""The systemd journal as an input: journalctl's entries read, grouped and turned into events,
the cursor their checkpoint. Pure decisions in cursor.py and entries.py, I/O in reader.py and probe.py."""
