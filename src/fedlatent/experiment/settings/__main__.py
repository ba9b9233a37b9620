"""``python -m fedlatent.experiment.settings``: rewrite configs/AUDIT.md's generated settings sections."""
from fedlatent.experiment.settings import main

main()
