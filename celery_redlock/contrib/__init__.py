"""Ready-made pieces for other libraries built on Celery; each module imports its
library, so import one only where that library is installed."""
