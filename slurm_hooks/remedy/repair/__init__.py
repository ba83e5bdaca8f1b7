"""The repair ladder: its state apart from its storage (:mod:`.state`) and its pure decision (:mod:`.ladder`)."""
