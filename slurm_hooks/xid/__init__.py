"""XIDs: the catalogue (what each XID means and what we do, generated) and the
per-node history of XIDs seen (what is still active, what was cleared)."""
