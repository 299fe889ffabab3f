"""The seam every input stands behind: files, stdin, the systemd journal (its cursor is its offset)."""
