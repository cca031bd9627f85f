"""Records as text: the console formats of Kafka's tools, JSON Lines records, the renderers of both
over a batch, and timestamps as people write them."""
