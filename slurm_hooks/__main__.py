from slurm_hooks.entry import main

main()
