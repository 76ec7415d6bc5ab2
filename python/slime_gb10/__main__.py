"""``python -m slime_gb10 ...`` = ``slime-gb10 ...`` (what ``torchrun -m slime_gb10 train`` launches)."""

from slime_gb10.cli import main

main()
