"""Inputs behind one seam (`base.Source`): files, stdin, the systemd journal (its cursor is its
offset); each reads into the writer's draft and never commits, sends or sleeps."""
