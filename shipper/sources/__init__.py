"""Inputs behind one seam (`base.Source`): files, stdin; each reads into the writer's draft."""
