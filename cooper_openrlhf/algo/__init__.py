"""Cooper's pure functions: the RM input template, pair selection and masking, losses, reward shaping."""
