"""One run end to end (:mod:`.single`): its checks before it trains (:mod:`.validation`), its folder,
progress, figures, trace and trackers. The bottom room of :mod:`fedlatent.experiment`: it imports no
other room."""
