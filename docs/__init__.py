"""The pages the tokcap CLI's messages name, shipped as package data (`tokcap docs TOPIC`)."""
