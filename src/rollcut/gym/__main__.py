"""``python -m rollcut.gym --spec JSON --worker-index …``: one worker of a server with several, as
its supervisor starts it (:func:`rollcut.gym._runners.worker_main`)."""

from ._runners import worker_main

worker_main()
