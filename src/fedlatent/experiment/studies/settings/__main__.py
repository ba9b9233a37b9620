"""``python -m fedlatent.experiment.studies.settings``: rewrite configs/AUDIT.md's generated settings sections."""
from fedlatent.experiment.studies.settings import main

main()
