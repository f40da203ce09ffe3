
,
aPlaceholder*
dtype0*
shape:
,
bPlaceholder*
dtype0*
shape:

cMulab*
T0"µ	