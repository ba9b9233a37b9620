"""fedlatent on Flower (Message API): the ServerApp, the ClientApp, the records between them and the
simulation engine. Needs the optional extra ``fedlatent[flower]``."""
