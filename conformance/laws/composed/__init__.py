"""Laws of parallelisms composed on a device mesh (capability "composed parallelism")."""
