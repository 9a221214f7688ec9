"""Networks: encoders, recurrent cores, action heads and the models built from them."""
