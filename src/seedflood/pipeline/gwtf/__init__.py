"""GWTF's decentralized routing (gwtf.md §4.3), apart from the centralized reference in flow.py
it is measured against: flow nodes that know only their own links, their neighbours' advertised
costs and the messages they receive. ``messages`` is the vocabulary the nodes speak and the
in-process mailbox that delivers it; ``links`` the link ends a node holds and the
request/accept/push-back protocol that keeps both ends of every link consistent; ``moves`` the
same-stage SWAP and REDIRECT improvements, accepted by simulated annealing; ``algorithm``
completes a node with its tick and churn repair and runs the nodes (``decentralized_flow``),
whose paths the simulation's GWTF router follows. Each module imports only those listed before
it, so the link protocol reads without the moves and the moves without the node's tick.
"""
