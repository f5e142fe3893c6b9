-- Before `kinbox migrate` reaches inbox step 6, on a large processed_events:
-- builds the covering primary key's index without holding off the workers'
-- claims. The step finds it by this name and only swaps the constraint.
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS processed_events_covering_key
    ON kinbox.processed_events (consumer, event_id) INCLUDE (payload_hash);
