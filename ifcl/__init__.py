"""IFCL: Identical and Fraternal Twins contrastive learning of sentence encoders, the Hugging Face way."""
