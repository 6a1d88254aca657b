//! The softverbs device runtime (transports first).
