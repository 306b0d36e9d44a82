"""elmo-pipeline stages: shard, train, embed, and the storage and config layers they share."""
