print("lattice")
